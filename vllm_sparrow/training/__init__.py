"""Training a Sparrow draft. The first piece: text-stream distillation from the target.

IVSB (intermediate-layer visual states) and MTP (feeding the draft's own states back) extend
this loop in their own modules; capture to shards lives in capture.py (training issue).
"""
