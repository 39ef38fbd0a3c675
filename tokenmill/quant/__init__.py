"""Weight formats as Linear quant methods (tokenmill/models/linear.py: LinearMethod)."""
from tokenmill.quant.unquantized import UnquantizedConfig

QuantConfig = UnquantizedConfig  # the one format today; int8/int4/GGUF-native methods plug in beside it

__all__ = ["QuantConfig", "UnquantizedConfig"]
