"""Print the eval table of one or more runs: python summarize.py runs/A_theta1e6 ..."""
import json, sys
cats = ["all", "content", "digit", "size", "colour", "shape", "region", "motion", "struct", "end"]
for d in sys.argv[1:]:
    print("==", d)
    print("step  time  ema    evalL  blankL | " + " ".join(f"{c[:6]:>11}" for c in cats) + "   (video/blank)")
    for line in open(f"{d}/log.jsonl"):
        r = json.loads(line)
        if "acc" not in r: continue
        ema = r["train_loss_ema"] or float("nan")
        print(f"{r['step']:5d} {r['elapsed']:5.0f} {ema:.3f} {r['eval_loss']:.3f} {r['blank_loss']:.3f} | "
              + " ".join(f"{r['acc'][c]:.2f}/{r['blank_acc'][c]:.2f}" for c in cats), f" step_s={r['step_s']}")
