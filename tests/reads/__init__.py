"""Tests of ivm/reads/."""
