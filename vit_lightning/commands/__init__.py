"""The commands: fit (one run) and reproduce (published weights evaluated), then docs, sweep and viz above fit,
results above viz, bench above sweep; each a folder or module that imports the floors below it
(vit_lightning/core/floors.py)."""
