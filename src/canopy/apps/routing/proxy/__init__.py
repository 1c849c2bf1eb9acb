"""OpenAI-compatible routing proxy (``canopy serve router``): needs the ``serve`` extra
(fastapi, uvicorn, httpx). Import :func:`canopy.apps.routing.proxy.app.create_app`."""
