"""Architecture name -> model class. All supported ones share the Llama implementation."""
from tokenmill.models.llama import LlamaForCausalLM
from tokenmill.models.model_config import SUPPORTED_ARCHITECTURES

MODEL_CLASSES = {arch: LlamaForCausalLM for arch in SUPPORTED_ARCHITECTURES}
