"""Grammars for constrained decoding, built from what a request says: JSON Schema → GBNF
(`json_schema.py`, the entry), the regular expressions of `pattern`, `format` and trigger
patterns (`patterns.py`), and the GBNF text and rule book every part writes through
(`gbnf.py`, `rulebook.py`). The ground floor: it imports nothing else of ours."""
