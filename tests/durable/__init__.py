"""Tests of ivm/durable/."""
