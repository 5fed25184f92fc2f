//! Writes a synthetic CT-like NIfTI folder, `DIR/{ball,cube}/case{i}.nii.gz` (`COUNT` volumes
//! per class of `SIDE`³ voxels at 1.5 mm, Hounsfield-like values with noise), to measure the
//! scan loader against the 3D ResNet-18's step (docs/performance.md, "Your own scans"):
//!
//! ```sh
//! cargo run --release -p ssl-data --features fixtures --example nifti_folder -- /tmp/ct 32 128
//! ssl run --config configs/ct-folder-3d.yaml --root /tmp/ct --epochs 2
//! ```

use anyhow::{Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ssl_data::scans::fixtures::write_nifti;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, count, side] = &args[..] else {
        anyhow::bail!("usage: nifti_folder DIR COUNT SIDE (e.g. /tmp/ct 32 128)");
    };
    let count: usize = count
        .parse()
        .context("COUNT is a number of volumes per class")?;
    let side: usize = side
        .parse()
        .context("SIDE is the volumes' side in voxels")?;
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    for (class, ball) in [("ball", true), ("cube", false)] {
        let class_dir = std::path::Path::new(dir).join(class);
        std::fs::create_dir_all(&class_dir).with_context(|| format!("cannot create {dir}"))?;
        for i in 0..count {
            let radius = side as f32 * rng.random_range(0.15..0.3);
            let centre: [f32; 3] =
                std::array::from_fn(|_| side as f32 * rng.random_range(0.35..0.65));
            let values: Vec<f32> = (0..side * side * side)
                .map(|v| {
                    let p = [v / (side * side), v / side % side, v % side];
                    let d = p.iter().zip(centre).map(|(&p, c)| (p as f32 - c).abs());
                    let inside = match ball {
                        true => d.map(|d| d * d).sum::<f32>().sqrt() < radius,
                        false => d.fold(0f32, f32::max) < radius * 0.8,
                    };
                    let tissue = if inside { 40.0 } else { -900.0 };
                    tissue + rng.random_range(-30.0..30.0)
                })
                .collect();
            let path = class_dir.join(format!("case{i}.nii.gz"));
            write_nifti(&path, &values, [side; 3], [1.5; 3]);
        }
    }
    println!("wrote {} volumes of {side}³ under {dir}", 2 * count);
    Ok(())
}
