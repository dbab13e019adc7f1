func.func @main(%arg0: tensor<256x256xf32>, %arg1: tensor<256x384xf32>) -> tensor<256x384xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<256x384xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<256x384xf32>) -> tensor<256x384xf32>
  %out = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2)>, affine_map<(d0, d1, d2) -> (d2, d1)>, affine_map<(d0, d1, d2) -> (d0, d1)>], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%arg0, %arg1 : tensor<256x256xf32>, tensor<256x384xf32>) outs(%acc : tensor<256x384xf32>) {
  ^bb0(%a: f32, %b: f32, %c: f32):
    %p = arith.mulf %a, %b : f32
    %s = arith.addf %c, %p : f32
    linalg.yield %s : f32
  } -> tensor<256x384xf32>
  return %out : tensor<256x384xf32>
}
