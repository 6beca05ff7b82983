"""Where raw data comes from: text files read in bounded pieces (``sources``), the built-in offline corpora
(``corpora``), folders of image files (``image_files``)."""
