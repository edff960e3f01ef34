"""What the adapter format (``registry/formats/lora.py``) builds on: its record checked
(``config.py``), its patterns matched in linear time (``patterns.py``), PEFT's LoRA layers copied
(``copies.py``) and PEFT's attach recorded and replayed (``replay.py``)."""
