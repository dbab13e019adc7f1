// 3x3 convolution, NHWC/HWCF, batch 1: IREE 3.13 matches specs on the batch-less op and llvm-cpu then
// re-expands its unit batch loop; the spec re-expands it itself and configures that (docs/search_space.md).
func.func @conv_unit_batch(%input: tensor<1x18x18x32xf32>, %filter: tensor<3x3x32x32xf32>) -> tensor<1x16x16x32xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<1x16x16x32xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<1x16x16x32xf32>) -> tensor<1x16x16x32xf32>
  %out = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%input, %filter : tensor<1x18x18x32xf32>, tensor<3x3x32x32xf32>)
      outs(%acc : tensor<1x16x16x32xf32>) -> tensor<1x16x16x32xf32>
  return %out : tensor<1x16x16x32xf32>
}
