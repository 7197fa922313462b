"""linattn: attention as matrix algebra.

Softmax attention, linear attention, the delta rule and their gated descendants (scalar decay, GLA,
Gated DeltaNet, Kimi Delta Attention), each in its parallel, recurrent and chunked forms.
The spec is `attention-as-matrix-algebra` ("the spec"); docstrings cite its sections.

- ``linattn.reference``: NumPy float64, one literal function per definition; the oracle.
- ``linattn.ops``: PyTorch ops with autograd, any device.
"""

__version__ = "0.1.0"
