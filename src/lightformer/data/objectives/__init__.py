"""What each objective does to a batch: BERT masking and T5 span corruption (``masking``), pixel palettes for
Image GPT (``pixels``), image augmentation on the training device (``augment``)."""
