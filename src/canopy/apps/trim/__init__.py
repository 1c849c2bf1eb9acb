"""Prompt trimming: a bandit per task category over trim levels (paper Section 5,
"Serving systems")."""
