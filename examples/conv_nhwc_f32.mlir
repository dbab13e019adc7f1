// 3x3 convolution, NHWC input, HWCF filter, stride 1: a ResNet-style 28x28x64 -> 64 layer.
func.func @conv(%input: tensor<1x30x30x64xf32>, %filter: tensor<3x3x64x64xf32>) -> tensor<1x28x28x64xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<1x28x28x64xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<1x28x28x64xf32>) -> tensor<1x28x28x64xf32>
  %out = linalg.conv_2d_nhwc_hwcf {dilations = dense<1> : tensor<2xi64>, strides = dense<1> : tensor<2xi64>}
      ins(%input, %filter : tensor<1x30x30x64xf32>, tensor<3x3x64x64xf32>)
      outs(%acc : tensor<1x28x28x64xf32>) -> tensor<1x28x28x64xf32>
  return %out : tensor<1x28x28x64xf32>
}
