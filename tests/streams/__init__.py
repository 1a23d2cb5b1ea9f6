"""Tests of ivm/streams/."""
