"""The commands: fit (one run), then docs, sweep and viz above it, results above viz, bench above sweep;
each a folder or module that imports the floors below it (vit_lightning/core/floors.py)."""
