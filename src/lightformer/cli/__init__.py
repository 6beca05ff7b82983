"""The command line: `lightformer fit|validate|test|predict|prepare` through LightningCLI (``main``), the
checks of a config before any data is prepared (``checks``), what every run gets around the Trainer
(``runs``) and the commands that take any task's checkpoint (``commands``)."""
