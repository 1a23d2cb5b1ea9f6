"""Tests of ivm/maintain/."""
