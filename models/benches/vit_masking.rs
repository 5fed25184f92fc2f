//! Times forward+backward of a ViT-S/16 on 224 px images with MAE-style random masking: the
//! encoder runs on the class token and the kept patches only
//! (`VisionTransformer::forward_tokens`), so its cost should fall with the kept fraction.
//! Prints the median time per mask ratio and its ratio to the unmasked step.
//!
//! `cargo bench -p ssl-models --bench vit_masking [-- BATCH [RUNS]]` (defaults 16 and 5).

use std::time::Instant;

use candle_core::{Device, Result, Tensor};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use ssl_models::{VisionTransformer, VitConfig};

fn median_ms(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?; // warm-up
    let mut times = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok((times[(runs - 1) / 2] + times[runs / 2]) / 2.0)
}

/// `[N, K]` u32: a random `K` of the `patches` for each of `n` images.
fn random_keep(n: usize, patches: usize, k: usize, rng: &mut ChaCha8Rng) -> Result<Tensor> {
    let mut rows = Vec::with_capacity(n * k);
    for _ in 0..n {
        let mut order: Vec<u32> = (0..patches as u32).collect();
        order.shuffle(rng);
        rows.extend_from_slice(&order[..k]);
    }
    Tensor::from_vec(rows, (n, k), &Device::Cpu)
}

fn main() -> Result<()> {
    // `cargo bench` passes `--bench`; the numbers are ours.
    let args: Vec<usize> = match std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(|a| a.parse())
        .collect()
    {
        Ok(args) => args,
        Err(error) => {
            eprintln!("error: {error}\nusage: vit_masking [BATCH [RUNS]] (defaults 16 and 5)");
            std::process::exit(2);
        }
    };
    let batch = args.first().copied().unwrap_or(16);
    let runs = args.get(1).copied().unwrap_or(5).max(1);
    let dev = Device::Cpu;
    let cfg = VitConfig::small();
    let store = ssl_core::ParamStore::new(0);
    let vit = VisionTransformer::new(&cfg, store.var_builder(&dev))?;
    let x = Tensor::randn(0f32, 1.0, (batch, 3, 224, 224), &dev)?;
    let patches = (224 / 16) * (224 / 16);
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    println!(
        "ViT-S/16, 224 px, B={batch}, forward+backward of every output token \
         (median of {runs}, {} threads):",
        candle_core::utils::get_num_threads()
    );
    let mut unmasked = None;
    for ratio in [0.0, 0.5, 0.75] {
        // MAE's count of kept patches.
        let k = (patches as f64 * (1.0 - ratio)) as usize;
        let keep = (ratio > 0.0)
            .then(|| random_keep(batch, patches, k, &mut rng))
            .transpose()?;
        let ms = median_ms(runs, || {
            let out = vit.forward_tokens(&x, keep.as_ref())?;
            (out.cls.sqr()?.mean_all()? + out.patches.sqr()?.mean_all()?)?.backward()?;
            Ok(())
        })?;
        let base = *unmasked.get_or_insert(ms);
        println!(
            "  mask ratio {ratio:.2} ({k:3} of {patches} patches kept, {:.2} of the tokens): \
             {ms:8.1} ms, {:.2} of the unmasked time",
            (k + 1) as f64 / (patches + 1) as f64,
            ms / base
        );
    }
    Ok(())
}
