"""Golden arrays for data/tests/torchvision.rs: torchvision's and PIL's outputs for fixed parameters.

Run from the repository root (needs torch, torchvision, Pillow and scikit-learn for the photo):

    python3 data/tests/golden/make_golden.py

The input photo is a 48 x 64 crop of scikit-learn's `china.jpg` (CC BY 2.0, see README.md here),
written once as `photo.png`; every golden is a float32 `.npy` (CHW in [0, 1], or normalised) or a
uint8 `.npy` (the PIL path, HWC). The 3D goldens use a seeded random volume `volume.npy`.
"""

import os

import numpy as np
import torch
import torch.nn.functional as tnf
import torchvision.transforms.functional as F
from PIL import Image
from torchvision.transforms import InterpolationMode

HERE = os.path.dirname(os.path.abspath(__file__))
BL, BC = InterpolationMode.BILINEAR, InterpolationMode.BICUBIC


def save(name, array):
    np.save(os.path.join(HERE, name + ".npy"), np.ascontiguousarray(array))


def photo():
    path = os.path.join(HERE, "photo.png")
    if not os.path.exists(path):
        import sklearn.datasets

        china = os.path.join(os.path.dirname(sklearn.datasets.__file__), "images", "china.jpg")
        Image.open(china).convert("RGB").crop((282, 174, 346, 222)).save(path)
    return Image.open(path).convert("RGB")


def main():
    torch.set_grad_enabled(False)
    pil = photo()
    x = F.to_tensor(pil)  # [3, 48, 64]
    assert x.shape == (3, 48, 64)

    # Resampling: a downscaling crop (antialiased) and an upscaling one, both filters.
    for name, mode in (("bilinear", BL), ("bicubic", BC)):
        down = F.resized_crop(x, 5, 8, 36, 48, [20, 24], mode, antialias=True)
        up = F.resized_crop(x, 15, 20, 10, 12, [24, 28], mode, antialias=True)
        save(f"resize_down_{name}", down.numpy())
        save(f"resize_up_{name}", up.numpy())
        pil_down = F.resized_crop(pil, 5, 8, 36, 48, [20, 24], mode)
        save(f"resize_down_{name}_pil", np.asarray(pil_down))

    # Colour ops, one at a time, float path.
    save("brightness_1.3", F.adjust_brightness(x, 1.3).numpy())
    save("contrast_0.6", F.adjust_contrast(x, 0.6).numpy())
    save("saturation_1.5", F.adjust_saturation(x, 1.5).numpy())
    save("saturation_0.3", F.adjust_saturation(x, 0.3).numpy())
    save("hue_0.08", F.adjust_hue(x, 0.08).numpy())
    save("hue_-0.17", F.adjust_hue(x, -0.17).numpy())
    save("grayscale", F.rgb_to_grayscale(x, 3).numpy())
    save("solarize", F.solarize(x, 0.5).numpy())
    # ... and the PIL path of the same ops (u8, HWC).
    save("contrast_0.6_pil", np.asarray(F.adjust_contrast(pil, 0.6)))
    save("hue_0.08_pil", np.asarray(F.adjust_hue(pil, 0.08)))
    save("saturation_1.5_pil", np.asarray(F.adjust_saturation(pil, 1.5)))

    # Gaussian blur, exact kernel with reflect padding: k = 23 (224-px rule) and k = 3 (32 px).
    save("blur_k23_s1.7", F.gaussian_blur(x, [23, 23], [1.7, 1.7]).numpy())
    save("blur_k3_s0.6", F.gaussian_blur(x, [3, 3], [0.6, 0.6]).numpy())

    # A whole view with fixed parameters, torchvision's order for the IConE pipeline:
    # crop + resize -> flip -> jitter in the order (hue, contrast, brightness, saturation)
    # -> grayscale (off) -> blur -> normalise (ImageNet).
    v = F.resized_crop(x, 3, 6, 40, 50, [48, 64], BL, antialias=True)
    v = F.hflip(v)
    v = F.adjust_hue(v, -0.05)
    v = F.adjust_contrast(v, 1.25)
    v = F.adjust_brightness(v, 0.8)
    v = F.adjust_saturation(v, 1.1)
    v = F.gaussian_blur(v, [7, 7], [0.9, 0.9])
    v = F.normalize(v, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    save("view_icone", v.numpy())

    # 3D (IConE App. A.2): trilinear resize of a cubic crop, rot90, average pooling.
    g = torch.Generator().manual_seed(7)
    vol = torch.rand(1, 12, 12, 12, generator=g)
    save("volume", vol.numpy())
    crop = vol[:, 2:11, 1:10, 3:12]  # side 9 at (z, y, x) = (2, 1, 3)
    up = tnf.interpolate(crop[None], size=(12, 12, 12), mode="trilinear", align_corners=False)[0]
    save("volume_crop_trilinear", up.numpy())
    save("volume_rot90_k1_dims12", torch.rot90(vol, 1, dims=(1, 2)).numpy())
    save("volume_rot90_k3_dims13", torch.rot90(vol, 3, dims=(1, 3)).numpy())
    pooled = tnf.avg_pool3d(vol[None], 3, stride=1, padding=1, count_include_pad=True)[0]
    save("volume_avgpool3", pooled.numpy())


if __name__ == "__main__":
    main()
