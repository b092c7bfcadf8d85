// Registration of the RoundToHalf op (its CPU kernel lives in cpu_kernel.cc; there is no
// GPU kernel: see the op's doc below).
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"

REGISTER_OP("RoundToHalf")
    .Input("x: float")
    .Output("y: float")
    .Attr("half_type: {half, bfloat16} = DT_HALF")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
Rounds every float32 value to the nearest value of a half type, kept in float32.

Bit for bit TensorFlow's Cast(Cast(x, half_type), float32) on a CPU, in one pass: round to
nearest even, overflow to +-inf (float16: 65520 and beyond), float16 subnormals kept
(2^-24 stays, 2^-25 ties to 0), +-0 and +-inf kept, nan -> the canonical quiet nan
(float16: the sign kept; bfloat16: +nan, as TensorFlow's vectorised Cast does). The output
reuses the input buffer when TensorFlow allows. CPU only: there is no GPU kernel.

x: the values to round.
y: x rounded to half_type, as float32.
half_type: float16 (half) or bfloat16.
)doc");
