"""Architectures (Llama, ViT) and Hugging Face weights in and out."""
