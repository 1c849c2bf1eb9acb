"""Applications: thin adapters from LLM-inference domains to the core."""
