"""What each objective does to a batch: BERT masking and T5 span corruption (``masking``), image augmentation on the
training device (``augment``), the vision-language chat layout (``chat``); Image GPT's pixel palettes are a
tokenizer (``lightformer.tokenization.pixels``)."""
