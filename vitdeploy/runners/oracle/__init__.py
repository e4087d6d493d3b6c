"""The oracle: a CPU runner that computes what TensorRT computes for our Q/DQ INT8 and FP16 ONNX artifacts.

Why: a CPU runtime runs a float16 Q/DQ graph however its version happens to (issue 24 measured one trt10 artifact
at 86.39% top-1 on ONNX Runtime 1.24 and 98.61% on 1.32), so accuracy for a TensorRT target is judged here, on
arithmetic that follows TensorRT's documented rules and depends on numpy only. ``loader.py`` lowers the graph
(Polygraphy's shape: the loader prepares, the runner executes), ``runner.py`` executes it in numpy.

The rules it follows, each with its source:

1. **Q/DQ fusion** (TensorRT developer guide, "Working with Quantized Types" → "Explicit Quantization": when
   TensorRT detects Q/DQ layers it builds with explicit quantization, and "when using pre-quantized weights, an
   IDequantizeLayer is required between the weights and the linear operator that uses them"; the 8.x guide's
   figures show a convolution fused with its input DQ layers, its output staying floating point when no Q
   follows). A MatMul / Gemm / Conv whose two inputs are both DequantizeLinear of int8 (an activation
   QuantizeLinear → DequantizeLinear pair, per tensor; a constant int8 weight, per tensor or per output
   channel; zero points 0) is lowered to ``MatMulInteger`` / ``ConvInteger`` on the int8 tensors, ``Cast`` to
   float32, ``Mul`` by the product of the two scales, and ``Cast`` to the DequantizeLinear's output type.
   A DequantizeLinear that feeds anything else is computed as ONNX defines it (q · scale in the scale's type).
2. **Accumulation.** An int8 GEMM accumulates exactly in int32 (computed as a float32 GEMM up to K = 1024 and
   float64 beyond: every partial sum is an integer below 2^24 resp. 2^53, so the sum is exact in any order;
   a layer with K > 131072, which could overflow int32, is not fused).
   The scale product is formed in float32 (exact for float16 scales: 11 × 11 significant bits fit in 24),
   the int32 sum is converted to float32 and multiplied by it once, a Gemm/Conv bias is added in float32,
   and the result is rounded once to the output type. A float16 MatMul/Gemm/Conv is computed in float32
   from its float16 inputs and rounded to float16 once (float32 accumulation: the rule issue 24 sets; the
   pages cited here do not document TensorRT's FP16 accumulator type, and a tactic that accumulates in
   float16 would differ).
3. **Activation quantization** (TensorRT "Working with Quantized Types": "quantization uses the reciprocal
   scale, followed by clamping and rounding"; TensorRT 8.5/8.6 operator docs, Quantize:
   ``clamp(round(input / scale + zero_point))``; ONNX QuantizeLinear: round half to even, saturate to
   [-128, 127]): x / scale in float32, rounded half to even, saturated. TensorRT multiplies by the reciprocal;
   the two differ only when the quotient lies within one float32 ulp of a .5 tie.
4. **Float parts run in the graph's declared types** (TensorRT guide, "Precision Control" → "Strongly Typed
   Networks": the model specifies the precision of every tensor and TensorRT adheres to it; 10.x with
   STRONGLY_TYPED, every 11.x network). Every op's result is rounded to its declared type (from ONNX shape
   inference), so float16 stays float16 between ops; float16 elementwise ops are correctly rounded (numpy
   computes them in float32, and 24 ≥ 2·11 + 2 bits makes the double rounding exact); transcendental ops,
   reductions, Softmax and LayerNormalization compute in float32 and round their result once.
5. **Layers an 8.x build pins to FP32** (``stages/engine.py pin_float32_layers``: ``layer.precision`` and the
   output types set to FP32 under OBEY_PRECISION_CONSTRAINTS): for ``trt8.5`` / ``trt8.6`` every Softmax,
   every reduction, every node ``graph/fp16.py fp32_islands`` names (LayerNorm, one op or spelled out,
   Pow, Sqrt) and every node numerics kept float32 (the manifest's kept_fp32_nodes: ``pinned_fp32_nodes``)
   computes from float32 inputs and outputs float32, whatever the graph declares. Other layers of
   a weakly typed 8.x build follow the graph's types here; its builder may still pick FP16 for an
   FP32-declared layer under the FP16 flag, which no CPU can predict.

What it does not model: the order of float32 accumulation inside TensorRT's kernels ("Precision Control":
different tactics use different accumulation orders, so builds are not bit-identical), fusions that round
fewer times than the graph spells (a MatMul's separate bias Add is rounded as its own op), and Q/DQ
propagation through shape ops (our graphs put each Q/DQ pair directly on the GEMM's input).
"""
