// 3x3 convolution, NHWC input, HWCF filter, stride 1, batch 2: a ResNet-style 28x28x64 -> 64 layer.
// (Batch 2, not 1: with a unit batch, IREE 3.13 llvm-cpu drops a spec-given config when it
// re-expands the unit dimension, so batch-1 convolutions cannot be tuned on CPU.)
func.func @conv(%input: tensor<2x30x30x64xf32>, %filter: tensor<3x3x64x64xf32>) -> tensor<2x28x28x64xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<2x28x28x64xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<2x28x28x64xf32>) -> tensor<2x28x28x64xf32>
  %out = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%input, %filter : tensor<2x30x30x64xf32>, tensor<3x3x64x64xf32>)
      outs(%acc : tensor<2x28x28x64xf32>) -> tensor<2x28x28x64xf32>
  return %out : tensor<2x28x28x64xf32>
}
