// A pre-norm transformer encoder block in f32, sized for a CPU: 128 tokens, model width 256,
// 4 attention heads of 64, feed-forward width 1024 (about 0.22 GFLOP per call).
//
//   h   = x + Wo . attention(LN1(x) Wq, LN1(x) Wk, LN1(x) Wv)      (softmax(Q K^T / 8) V per head)
//   out = h + W2 . relu(LN2(h) W1 + b1) + b2
//
// Weights are arguments so that the outputs of two builds can be compared on random weights.
// Matmuls and batch matmuls are the tunable dispatches; layer norms, softmax, the bias + relu and
// the residual adds are elementwise/reduction dispatches or fuse into their producers.

#id2 = affine_map<(i, j) -> (i, j)>
#row2 = affine_map<(i, j) -> (i)>
#col2 = affine_map<(i, j) -> (j)>
#id3 = affine_map<(h, i, j) -> (h, i, j)>
#row3 = affine_map<(h, i, j) -> (h, i)>

func.func @main(%x: tensor<128x256xf32>,
                %ln1_g: tensor<256xf32>, %ln1_b: tensor<256xf32>,
                %wq: tensor<256x256xf32>, %wk: tensor<256x256xf32>, %wv: tensor<256x256xf32>,
                %wo: tensor<256x256xf32>,
                %ln2_g: tensor<256xf32>, %ln2_b: tensor<256xf32>,
                %w1: tensor<256x1024xf32>, %b1: tensor<1024xf32>,
                %w2: tensor<1024x256xf32>, %b2: tensor<256xf32>) -> tensor<128x256xf32> {
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant -3.40282347E+38 : f32

  // ---- attention ---------------------------------------------------------------------------
  %n1 = call @layer_norm(%x, %ln1_g, %ln1_b) : (tensor<128x256xf32>, tensor<256xf32>, tensor<256xf32>) -> tensor<128x256xf32>
  %e_proj = tensor.empty() : tensor<128x256xf32>
  %z_proj = linalg.fill ins(%zero : f32) outs(%e_proj : tensor<128x256xf32>) -> tensor<128x256xf32>
  %q = linalg.matmul ins(%n1, %wq : tensor<128x256xf32>, tensor<256x256xf32>) outs(%z_proj : tensor<128x256xf32>) -> tensor<128x256xf32>
  %k = linalg.matmul ins(%n1, %wk : tensor<128x256xf32>, tensor<256x256xf32>) outs(%z_proj : tensor<128x256xf32>) -> tensor<128x256xf32>
  %v = linalg.matmul ins(%n1, %wv : tensor<128x256xf32>, tensor<256x256xf32>) outs(%z_proj : tensor<128x256xf32>) -> tensor<128x256xf32>

  // Split heads: Q, V -> [head, token, 64]; K -> [head, 64, token] (K^T, so scores are a plain
  // batch matmul).
  %q3 = tensor.expand_shape %q [[0], [1, 2]] output_shape [128, 4, 64] : tensor<128x256xf32> into tensor<128x4x64xf32>
  %k3 = tensor.expand_shape %k [[0], [1, 2]] output_shape [128, 4, 64] : tensor<128x256xf32> into tensor<128x4x64xf32>
  %v3 = tensor.expand_shape %v [[0], [1, 2]] output_shape [128, 4, 64] : tensor<128x256xf32> into tensor<128x4x64xf32>
  %e_hsd = tensor.empty() : tensor<4x128x64xf32>
  %e_hds = tensor.empty() : tensor<4x64x128xf32>
  %qh = linalg.transpose ins(%q3 : tensor<128x4x64xf32>) outs(%e_hsd : tensor<4x128x64xf32>) permutation = [1, 0, 2]
  %kt = linalg.transpose ins(%k3 : tensor<128x4x64xf32>) outs(%e_hds : tensor<4x64x128xf32>) permutation = [1, 2, 0]
  %vh = linalg.transpose ins(%v3 : tensor<128x4x64xf32>) outs(%e_hsd : tensor<4x128x64xf32>) permutation = [1, 0, 2]

  %e_ss = tensor.empty() : tensor<4x128x128xf32>
  %z_ss = linalg.fill ins(%zero : f32) outs(%e_ss : tensor<4x128x128xf32>) -> tensor<4x128x128xf32>
  %scores = linalg.batch_matmul ins(%qh, %kt : tensor<4x128x64xf32>, tensor<4x64x128xf32>) outs(%z_ss : tensor<4x128x128xf32>) -> tensor<4x128x128xf32>

  // Softmax over keys of scores / sqrt(64): max, exp(s - max) and sum, normalise.
  %e_hs = tensor.empty() : tensor<4x128xf32>
  %m_init = linalg.fill ins(%ninf : f32) outs(%e_hs : tensor<4x128xf32>) -> tensor<4x128xf32>
  %row_max = linalg.generic {indexing_maps = [#id3, #row3], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%scores : tensor<4x128x128xf32>) outs(%m_init : tensor<4x128xf32>) {
    ^bb0(%s: f32, %acc: f32):
      %m = arith.maximumf %s, %acc : f32
      linalg.yield %m : f32
  } -> tensor<4x128xf32>
  %exp = linalg.generic {indexing_maps = [#id3, #row3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%scores, %row_max : tensor<4x128x128xf32>, tensor<4x128xf32>) outs(%e_ss : tensor<4x128x128xf32>) {
    ^bb0(%s: f32, %m: f32, %o: f32):
      %scale = arith.constant 0.125 : f32
      %d = arith.subf %s, %m : f32
      %t = arith.mulf %d, %scale : f32
      %e = math.exp %t : f32
      linalg.yield %e : f32
  } -> tensor<4x128x128xf32>
  %s_init = linalg.fill ins(%zero : f32) outs(%e_hs : tensor<4x128xf32>) -> tensor<4x128xf32>
  %row_sum = linalg.generic {indexing_maps = [#id3, #row3], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%exp : tensor<4x128x128xf32>) outs(%s_init : tensor<4x128xf32>) {
    ^bb0(%e: f32, %acc: f32):
      %a = arith.addf %e, %acc : f32
      linalg.yield %a : f32
  } -> tensor<4x128xf32>
  %probs = linalg.generic {indexing_maps = [#id3, #row3, #id3], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%exp, %row_sum : tensor<4x128x128xf32>, tensor<4x128xf32>) outs(%e_ss : tensor<4x128x128xf32>) {
    ^bb0(%e: f32, %s: f32, %o: f32):
      %p = arith.divf %e, %s : f32
      linalg.yield %p : f32
  } -> tensor<4x128x128xf32>

  %z_hsd = linalg.fill ins(%zero : f32) outs(%e_hsd : tensor<4x128x64xf32>) -> tensor<4x128x64xf32>
  %ctx = linalg.batch_matmul ins(%probs, %vh : tensor<4x128x128xf32>, tensor<4x128x64xf32>) outs(%z_hsd : tensor<4x128x64xf32>) -> tensor<4x128x64xf32>
  // Merge heads back to [token, 256].
  %e_shd = tensor.empty() : tensor<128x4x64xf32>
  %ctx_t = linalg.transpose ins(%ctx : tensor<4x128x64xf32>) outs(%e_shd : tensor<128x4x64xf32>) permutation = [1, 0, 2]
  %ctx2 = tensor.collapse_shape %ctx_t [[0], [1, 2]] : tensor<128x4x64xf32> into tensor<128x256xf32>
  %attn = linalg.matmul ins(%ctx2, %wo : tensor<128x256xf32>, tensor<256x256xf32>) outs(%z_proj : tensor<128x256xf32>) -> tensor<128x256xf32>
  %h = linalg.generic {indexing_maps = [#id2, #id2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%x, %attn : tensor<128x256xf32>, tensor<128x256xf32>) outs(%e_proj : tensor<128x256xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %s = arith.addf %a, %b : f32
      linalg.yield %s : f32
  } -> tensor<128x256xf32>

  // ---- feed-forward --------------------------------------------------------------------------
  %n2 = call @layer_norm(%h, %ln2_g, %ln2_b) : (tensor<128x256xf32>, tensor<256xf32>, tensor<256xf32>) -> tensor<128x256xf32>
  %e_ff = tensor.empty() : tensor<128x1024xf32>
  %z_ff = linalg.fill ins(%zero : f32) outs(%e_ff : tensor<128x1024xf32>) -> tensor<128x1024xf32>
  %up = linalg.matmul ins(%n2, %w1 : tensor<128x256xf32>, tensor<256x1024xf32>) outs(%z_ff : tensor<128x1024xf32>) -> tensor<128x1024xf32>
  %act = linalg.generic {indexing_maps = [#id2, #col2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%up, %b1 : tensor<128x1024xf32>, tensor<1024xf32>) outs(%e_ff : tensor<128x1024xf32>) {
    ^bb0(%a: f32, %b: f32, %o: f32):
      %s = arith.addf %a, %b : f32
      %r = arith.maximumf %s, %zero : f32
      linalg.yield %r : f32
  } -> tensor<128x1024xf32>
  %down = linalg.matmul ins(%act, %w2 : tensor<128x1024xf32>, tensor<1024x256xf32>) outs(%z_proj : tensor<128x256xf32>) -> tensor<128x256xf32>
  %out = linalg.generic {indexing_maps = [#id2, #id2, #col2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%h, %down, %b2 : tensor<128x256xf32>, tensor<128x256xf32>, tensor<256xf32>) outs(%e_proj : tensor<128x256xf32>) {
    ^bb0(%a: f32, %b: f32, %c: f32, %o: f32):
      %s = arith.addf %a, %b : f32
      %t = arith.addf %s, %c : f32
      linalg.yield %t : f32
  } -> tensor<128x256xf32>
  return %out : tensor<128x256xf32>
}

// Layer norm over the last dimension (eps 1e-5): (x - mean) / sqrt(var + eps) * gamma + beta.
func.func private @layer_norm(%x: tensor<128x256xf32>, %g: tensor<256xf32>, %b: tensor<256xf32>) -> tensor<128x256xf32> {
  %zero = arith.constant 0.0 : f32
  %e_r = tensor.empty() : tensor<128xf32>
  %z_r = linalg.fill ins(%zero : f32) outs(%e_r : tensor<128xf32>) -> tensor<128xf32>
  %sum = linalg.generic {indexing_maps = [#id2, #row2], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<128x256xf32>) outs(%z_r : tensor<128xf32>) {
    ^bb0(%a: f32, %acc: f32):
      %s = arith.addf %a, %acc : f32
      linalg.yield %s : f32
  } -> tensor<128xf32>
  %sq = linalg.generic {indexing_maps = [#id2, #row2, #row2], iterator_types = ["parallel", "reduction"]}
      ins(%x, %sum : tensor<128x256xf32>, tensor<128xf32>) outs(%z_r : tensor<128xf32>) {
    ^bb0(%a: f32, %s: f32, %acc: f32):
      %inv_n = arith.constant 3.906250e-03 : f32
      %mean = arith.mulf %s, %inv_n : f32
      %d = arith.subf %a, %mean : f32
      %d2 = arith.mulf %d, %d : f32
      %r = arith.addf %d2, %acc : f32
      linalg.yield %r : f32
  } -> tensor<128xf32>
  %e = tensor.empty() : tensor<128x256xf32>
  %y = linalg.generic {indexing_maps = [#id2, #row2, #row2, #col2, #col2, #id2], iterator_types = ["parallel", "parallel"]}
      ins(%x, %sum, %sq, %g, %b : tensor<128x256xf32>, tensor<128xf32>, tensor<128xf32>, tensor<256xf32>, tensor<256xf32>)
      outs(%e : tensor<128x256xf32>) {
    ^bb0(%a: f32, %s: f32, %v: f32, %gamma: f32, %beta: f32, %o: f32):
      %inv_n = arith.constant 3.906250e-03 : f32
      %eps = arith.constant 1.0e-05 : f32
      %mean = arith.mulf %s, %inv_n : f32
      %var = arith.mulf %v, %inv_n : f32
      %ve = arith.addf %var, %eps : f32
      %rstd = math.rsqrt %ve : f32
      %d = arith.subf %a, %mean : f32
      %n = arith.mulf %d, %rstd : f32
      %gn = arith.mulf %n, %gamma : f32
      %r = arith.addf %gn, %beta : f32
      linalg.yield %r : f32
  } -> tensor<128x256xf32>
  return %y : tensor<128x256xf32>
}
