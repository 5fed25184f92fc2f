//! Views per second per core of the augmentation pipelines through the loader, against
//! `pipeline.py` beside this file (torchvision with the PIL backend, and the same 3D ops in
//! PyTorch) on the same machine:
//!
//! ```sh
//! cargo bench -p ssl-data --bench pipeline -- --views 2000
//! python3 data/benches/pipeline.py --views 2000
//! ```
//!
//! Both run on one thread and read the same inputs: the golden photo (`tests/golden/photo.png`)
//! resized to 224 and 32 px (stored as 8-bit HWC, as MedMNIST and image folders are), and
//! seeded random 8-bit volumes at 64³; a view is the recipe's full output, normalised.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ssl_data::{resample, CropBox, Dataset, Interpolation, Recipe, Samples, ViewLoader};

const INSTANCES: usize = 64;

fn photo_at(side: usize) -> Result<Dataset> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/photo.png");
    let img = image::open(path)
        .context("tests/golden/photo.png")?
        .to_rgb8();
    let (w, h) = (img.width() as usize, img.height() as usize);
    let mut chw = vec![0f32; 3 * h * w];
    for (x, y, p) in img.enumerate_pixels() {
        for c in 0..3 {
            chw[c * h * w + y as usize * w + x as usize] = p[c] as f32 / 255.0;
        }
    }
    let full = CropBox {
        top: 0,
        left: 0,
        height: h,
        width: w,
    };
    let mut resized = vec![0f32; 3 * side * side];
    resample::resized_crop(
        &chw,
        h,
        w,
        full,
        side,
        side,
        Interpolation::Bilinear,
        &mut resized,
    );
    let mut hwc = Vec::with_capacity(INSTANCES * 3 * side * side);
    for _ in 0..INSTANCES {
        for i in 0..side * side {
            for c in 0..3 {
                let v = resized[c * side * side + i];
                hwc.push((v * 255.0).round().clamp(0.0, 255.0) as u8);
            }
        }
    }
    Ok(dataset(hwc, vec![3, side, side], Some(3)))
}

fn volumes(side: usize) -> Dataset {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let bytes = (0..INSTANCES * side * side * side)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 56) as u8
        })
        .collect();
    dataset(bytes, vec![1, side, side, side], None)
}

fn dataset(bytes: Vec<u8>, shape: Vec<usize>, channels_last: Option<usize>) -> Dataset {
    Dataset {
        name: "bench".into(),
        samples: Samples::U8 {
            bytes: Arc::new(bytes),
            channels_last,
        },
        labels: vec![0; INSTANCES],
        shape,
        num_classes: 1,
    }
}

/// Views per second of `recipe` on `data`, on the calling thread's one-thread pool.
fn views_per_second(recipe: Recipe, data: Dataset, views: usize) -> Result<f64> {
    let types = recipe.view_types(recipe.default_normalization(), &data.shape)?;
    let loader = ViewLoader::new(
        Arc::new(data),
        (0..INSTANCES).collect(),
        INSTANCES,
        2,
        false,
        0,
        types.views,
    )?;
    let _warm = loader.epoch(0).next();
    let start = Instant::now();
    let mut made = 0;
    let mut epoch = 1;
    while made < views {
        for batch in loader.epoch(epoch) {
            made += batch.views_count * batch.batch_size;
        }
        epoch += 1;
    }
    Ok(made as f64 / start.elapsed().as_secs_f64())
}

fn main() -> Result<()> {
    let mut views = 2000;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--views" => views = args.next().context("--views needs a number")?.parse()?,
            "--bench" => {}
            other => bail!("unknown argument `{other}` (expected --views N)"),
        }
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let rows = [
        ("icone_224", Recipe::Icone, photo_at(224)?, views),
        ("frossl_32", Recipe::Frossl, photo_at(32)?, 10 * views),
        ("icone3d_64", Recipe::Icone3d, volumes(64), views / 10),
    ];
    for (name, recipe, data, n) in rows {
        let rate = pool.install(|| views_per_second(recipe, data, n))?;
        println!(
            "{}",
            serde_json::json!({"pipeline": name, "framework": "candle-ssl", "threads": 1,
                "views": n, "views_per_s": rate})
        );
    }
    Ok(())
}
