"""umsearch: plan pipeline-parallel training with unequal microbatches."""
__version__ = "0.1.0"
