"""The CUDA cards as torch sees them, printed for ``prereqs`` (probe ``torch_cuda_props``).

Run by file path in another interpreter (``python .../torch_props.py``), so a torch that crashes or
hangs on import takes down only this probe. Prints two lines: a JSON list of the cards (name, compute
capability, memory in bytes), then whether bf16 works, the cuDNN version and the NCCL version.
"""

import json

import torch


def main() -> None:
    n = torch.cuda.device_count()
    props = [torch.cuda.get_device_properties(i) for i in range(n)]
    print(json.dumps([{"name": p.name, "cc": [p.major, p.minor], "mem": p.total_memory} for p in props]))
    bf16 = torch.cuda.is_bf16_supported() if n else False
    print(bf16, torch.backends.cudnn.version(), torch.cuda.nccl.version() if n else None)


if __name__ == "__main__":
    main()
