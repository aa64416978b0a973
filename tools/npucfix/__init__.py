"""Builders and checks for npuc's ONNX decoder fixtures.

Forms (see meta.json "form"):
  f1  float32, torch/optimum-style decomposed graph (opset 18)        form1.py
  f2  onnxruntime-genai style INT4 graph (opset 21 + com.microsoft)    form2.py
  f3  A8W8 QDQ graph from onnxruntime.quantization.quantize_static     form3.py
  f4  opset 23 graph with RMSNormalization / RotaryEmbedding / Attention  form4.py

reference.py is the numpy decoder every graph is checked against.
"""
