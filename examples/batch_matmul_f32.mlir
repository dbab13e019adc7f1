// Batched f32 matmul: 8 x (128x128x256), as in multi-head attention score products.
func.func @batch_matmul(%lhs: tensor<8x128x256xf32>, %rhs: tensor<8x256x128xf32>) -> tensor<8x128x128xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<8x128x128xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<8x128x128xf32>) -> tensor<8x128x128xf32>
  %out = linalg.batch_matmul ins(%lhs, %rhs : tensor<8x128x256xf32>, tensor<8x256x128xf32>)
                             outs(%acc : tensor<8x128x128xf32>) -> tensor<8x128x128xf32>
  return %out : tensor<8x128x128xf32>
}
