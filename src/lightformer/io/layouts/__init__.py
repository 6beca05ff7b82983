"""Each model family's layouts (``export --layout NAME`` and the way back), one module per family: ``gpt`` (GPT-2 and
Llama), ``bert``, ``vit`` (Hugging Face and timm), ``marian``,
``clip`` (the contrastive model's ``CLIPModel``), ``llava`` (the vision-language model's
``LlavaForConditionalGeneration``). A task declares its own with its registration
(``lightformer.registry.register(..., layouts={"hf": gpt.HF})``); what every Hugging Face layout shares (the folder,
its config.json, weights and model card) is ``lightformer.io.hf_layouts``'.
"""
