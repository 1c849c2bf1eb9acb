"""Canopy inside other serving stacks: :mod:`canopy.integrations.litellm` (the ``litellm``
extra) plugs the regional router into a LiteLLM ``Router``."""
