module ckpt

go 1.26.0
