"""lightformer: one set of transformer blocks for text, translation and vision, trained with Lightning."""

__version__ = "0.1.0"
