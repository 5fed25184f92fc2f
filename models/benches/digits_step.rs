//! Times forward+backward of DigitsCnn + Projector (128→512→512) on B = 256 images 1×16×16 with
//! this crate's im2col conv and fused BN, against the same network built from candle's conv2d and
//! `candle_nn::BatchNorm::forward_train`. Prints the median of 10 runs and the ratio.

use std::time::Instant;

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{BatchNorm as CBatchNorm, Linear, VarBuilder, VarMap};
use ssl_models::{DigitsCnn, Projector};

struct StockCnn {
    convs: Vec<(Tensor, usize)>,
    bns: Vec<CBatchNorm>,
    fc: Linear,
    proj: Vec<(Linear, CBatchNorm)>,
    last: Linear,
}

impl StockCnn {
    fn new(vb: VarBuilder) -> Result<Self> {
        let mut convs = Vec::new();
        let mut bns = Vec::new();
        let mut c_in = 1;
        for (i, (c, s)) in [(32, 1), (64, 2), (128, 2)].into_iter().enumerate() {
            let w = vb.get((c, c_in, 3, 3), &format!("conv{i}"))?;
            convs.push((w, s));
            bns.push(candle_nn::batch_norm(c, 1e-5, vb.pp(format!("bn{i}")))?);
            c_in = c;
        }
        let fc = candle_nn::linear(128, 128, vb.pp("fc"))?;
        let proj = vec![(
            candle_nn::linear(128, 512, vb.pp("p0"))?,
            candle_nn::batch_norm(512, 1e-5, vb.pp("pbn0"))?,
        )];
        let last = candle_nn::linear(512, 512, vb.pp("last"))?;
        Ok(Self {
            convs,
            bns,
            fc,
            proj,
            last,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for ((w, s), bn) in self.convs.iter().zip(&self.bns) {
            h = h.conv2d(w, 1, *s, 1, 1)?;
            h = bn.forward_train(&h)?.relu()?;
        }
        let mut h = self.fc.forward(&h.mean((2, 3))?)?;
        for (l, bn) in &self.proj {
            h = bn.forward_train(&l.forward(&h)?)?.relu()?;
        }
        self.last.forward(&h)
    }
}

fn median_ms(mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?; // warm-up
    let mut times = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok((times[4] + times[5]) / 2.0)
}

fn main() -> Result<()> {
    let dev = Device::Cpu;
    let x = Tensor::randn(0f32, 1.0, (256, 1, 16, 16), &dev)?;

    let store = ssl_core::ParamStore::new(0);
    let vb = store.var_builder(&dev);
    let enc = DigitsCnn::new(1, vb.pp("encoder"))?;
    let proj = Projector::new(enc.output_dim(), &[512, 512], vb.pp("projector"))?;
    let ours = median_ms(|| {
        let z = proj.forward_t(&enc.forward_t(&x, true)?, true)?;
        z.sqr()?.mean_all()?.backward()?;
        Ok(())
    })?;

    let vm = VarMap::new();
    let svb = VarBuilder::from_varmap(&vm, DType::F32, &dev);
    let stock = StockCnn::new(svb)?;
    let base = median_ms(|| {
        let z = stock.forward(&x)?;
        z.sqr()?.mean_all()?.backward()?;
        Ok(())
    })?;
    println!(
        "digits CNN + projector 128-512-512, B=256, 1x16x16, forward+backward (median of 10, {} threads):",
        candle_core::utils::get_num_threads()
    );
    println!("  ssl-models (im2col conv + fused BN): {ours:.1} ms");
    println!("  stock candle (conv2d + BatchNorm):   {base:.1} ms");
    println!("  speed-up: {:.2}x", base / ours);
    Ok(())
}
