"""A model module whose own code fails on import (tests/training/test_factory.py)."""

raise RuntimeError("boom at import")
