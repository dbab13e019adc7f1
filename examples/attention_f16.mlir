// Single-head-group attention, f16: 4 heads, 256 queries, 256 keys, head dim 64 (a small transformer block).
func.func @attention(%q: tensor<4x256x64xf16>, %k: tensor<4x256x64xf16>, %v: tensor<4x256x64xf16>) -> tensor<4x256x64xf16> {
  %scale = arith.constant 0.125 : f16
  %empty = tensor.empty() : tensor<4x256x64xf16>
  %out = iree_linalg_ext.attention <{indexing_maps = [
            affine_map<(b, m, n, k1, k2) -> (b, m, k1)>,
            affine_map<(b, m, n, k1, k2) -> (b, k2, k1)>,
            affine_map<(b, m, n, k1, k2) -> (b, k2, n)>,
            affine_map<(b, m, n, k1, k2) -> ()>,
            affine_map<(b, m, n, k1, k2) -> (b, m, n)>]}>
      ins(%q, %k, %v, %scale : tensor<4x256x64xf16>, tensor<4x256x64xf16>, tensor<4x256x64xf16>, f16)
      outs(%empty : tensor<4x256x64xf16>) {
    ^bb0(%score: f32):
      iree_linalg_ext.yield %score : f32
  } -> tensor<4x256x64xf16>
  return %out : tensor<4x256x64xf16>
}
