func.func @main(%arg0: tensor<2x16x16x128xf32>, %arg1: tensor<3x3x128x128xf32>) -> tensor<2x14x14x128xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<2x14x14x128xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<2x14x14x128xf32>) -> tensor<2x14x14x128xf32>
  %out = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d0, d1 + d4, d2 + d5, d6)>, affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d4, d5, d6, d3)>, affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]}
      ins(%arg0, %arg1 : tensor<2x16x16x128xf32>, tensor<3x3x128x128xf32>) outs(%acc : tensor<2x14x14x128xf32>) {
  ^bb0(%a: f32, %b: f32, %c: f32):
    %p = arith.mulf %a, %b : f32
    %s = arith.addf %c, %p : f32
    linalg.yield %s : f32
  } -> tensor<2x14x14x128xf32>
  return %out : tensor<2x14x14x128xf32>
}
