"""Tests of recstream.callbacks."""
