"""Test-time search: offline replay on logged answers and live value-guided search (paper
Section 4, "Test-time search")."""
