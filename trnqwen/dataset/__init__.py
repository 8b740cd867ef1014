"""Your own data for fine-tuning: formats, chat templates, assistant-only labels, packing, cache.

The launcher tokenizes a dataset once (``prepare``) into a memory-mapped cache (``cache``);
every rank of every backend reads its rows from there.
"""
