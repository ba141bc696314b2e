"""Test packages. This file makes tests/moetables import as tests.moetables, so that it never
shadows the real moetables package (pytest puts the first folder without __init__.py on sys.path)."""
