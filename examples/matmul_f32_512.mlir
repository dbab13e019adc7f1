// 512x512x512 f32 matmul (row-major A and B).
func.func @matmul(%lhs: tensor<512x512xf32>, %rhs: tensor<512x512xf32>) -> tensor<512x512xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<512x512xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<512x512xf32>) -> tensor<512x512xf32>
  %out = linalg.matmul ins(%lhs, %rhs : tensor<512x512xf32>, tensor<512x512xf32>)
                       outs(%acc : tensor<512x512xf32>) -> tensor<512x512xf32>
  return %out : tensor<512x512xf32>
}
