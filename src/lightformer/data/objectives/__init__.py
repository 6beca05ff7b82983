"""What each objective does to a batch: masking and span corruption, image augmentation, the chat layout."""
