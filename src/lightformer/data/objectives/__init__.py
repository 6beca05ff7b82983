"""What each objective does to a batch: masking and span corruption (``masking``), image augmentation on the device
(``augment``), the chat layout (``chat``); Image GPT's palettes are a tokenizer (``tokenization.pixels``)."""
