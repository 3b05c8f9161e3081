"""Docs tests: the page-reading helpers (doc_text.py) on the path (--import-mode=importlib)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
