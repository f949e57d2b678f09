"""Check patchify() == Qwen2VLVideoProcessor output, the vocab/tokenizer, and time render/patchify."""
import time, numpy as np, torch, transformers as tf
from common import *
vocab = build_vocab(); print("vocab", len(vocab))
tok = make_hf_tokenizer(vocab)
w = World(vocab)
scene = sample_scene(3); frames = render(scene)
px = {"shortest_edge": 56 * 56, "longest_edge": 112 * 112}
vp = tf.Qwen2VLVideoProcessor(size=px, patch_size=14, temporal_patch_size=2, merge_size=2, cap_pixels_per_frame=False)
out = vp(videos=[frames], return_tensors="pt", do_sample_frames=False)
mine, grid = patchify(frames)
print(out["pixel_values_videos"].shape, mine.shape, out["video_grid_thw"], grid)
print("maxdiff", (out["pixel_values_videos"].numpy() - mine).__abs__().max())
c = caption(scene); print(c); print(len(c.split()), tok(c)["input_ids"][:10], tok.decode(tok(c)["input_ids"])[:60])
print(list(zip(c.split(), categorize(c.split())))[:30])
t=time.time()
for s in range(20): w.sample(s)
print("sample s/clip", (time.time()-t)/20)
lens=[len(caption(sample_scene(s)).split()) for s in range(500)]; print("caption len mean/max", np.mean(lens), max(lens))
p=w.positions(300); print(p[:, :3], p[:, 250:265])
