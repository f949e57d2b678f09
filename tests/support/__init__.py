"""The test kit's helpers, shared by the test files (never by the product): tiny drafts and their
token I/O, the dense reference of the draft's window rule, the clips and datasets the capture and
training tests write, engine probes, the lossless batch both runners' tests send, distribution
checks, and what the Ray and heavy-video tests share."""
