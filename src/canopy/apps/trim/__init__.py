"""Prompt trimming: the routing application's regional bandit over trim levels, task categories
as regions (paper Section 4, "Serving systems")."""
