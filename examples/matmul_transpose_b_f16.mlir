// f16 x f16 -> f32 matmul with a transposed B operand (C[m,n] += A[m,k] * B[n,k]), 256x384x512.
#map_lhs = affine_map<(d0, d1, d2) -> (d0, d2)>
#map_rhs = affine_map<(d0, d1, d2) -> (d1, d2)>
#map_out = affine_map<(d0, d1, d2) -> (d0, d1)>
func.func @matmul_transpose_b(%lhs: tensor<256x512xf16>, %rhs: tensor<384x512xf16>) -> tensor<256x384xf32> {
  %zero = arith.constant 0.0 : f32
  %empty = tensor.empty() : tensor<256x384xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%empty : tensor<256x384xf32>) -> tensor<256x384xf32>
  %out = linalg.generic {indexing_maps = [#map_lhs, #map_rhs, #map_out],
                         iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%lhs, %rhs : tensor<256x512xf16>, tensor<384x512xf16>) outs(%acc : tensor<256x384xf32>) {
  ^bb0(%a: f16, %b: f16, %c: f32):
    %a32 = arith.extf %a : f16 to f32
    %b32 = arith.extf %b : f16 to f32
    %p = arith.mulf %a32, %b32 : f32
    %s = arith.addf %c, %p : f32
    linalg.yield %s : f32
  } -> tensor<256x384xf32>
  return %out : tensor<256x384xf32>
}
