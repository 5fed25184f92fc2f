//! What each objective costs inside a real training step on the digits CNN (the main job's
//! encoder and projector, B = 128 instances unless `--batch` says otherwise).
//!
//! For every registered objective: the median time of a full step (forward + loss + backward +
//! AdamW, V = 2), of the loss alone (forward + backward on a `[V, B, D]` projection tensor) and of
//! the encoder (+ projector) forward and backward alone, with their shares of the step (the rest is
//! the optimiser and the step's plumbing). The three are timed in turn, round after round, and each
//! share is the median of the per-round ratios, so a slow spell of a shared machine moves numerator
//! and denominator together. Then the FroSSL step at V = 8 against V = 2 (4× the images), and the
//! share of the step of SwAV's Sinkhorn–Knopp and SAG-VICReg's kNN affinity. Run with
//! `cargo bench -p ssl-train --bench objective_step -- [--reps N] [--batch B] [--objectives a,b] [--ratio frossl,...]`;
//! `RAYON_NUM_THREADS` sets the threads. `-- --profile-loss NAME --reps 500` only calls that
//! objective's loss + backward, for a profiler.

use std::time::Instant;

use anyhow::Result;
use candle_core::{Device, Tensor, Var};
use ssl_core::{Batch, Ids, Progress, SingleProcess};
use ssl_optim::Optimizer;
use ssl_train::config::RunConfig;
use ssl_train::model::{self, Model};
use ssl_train::setup;
use ssl_train::trainer::{self, StepInput};

fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// A run configuration for `objective` at `views`. W-MSE and CorInfoMax get the 64-d projection
/// their papers use (W-MSE must whiten 128-sample sub-batches; CorInfoMax's d×d log-determinants
/// cost O(d³) on the host, 32 % of the step at d = 512).
fn config(objective: &str, views: usize, batch: usize) -> Result<RunConfig> {
    let mut root = serde_yaml::Value::Mapping(Default::default());
    ssl_train::config::apply_set(&mut root, &format!("objective.name={objective}"))?;
    ssl_train::config::apply_set(&mut root, &format!("train.views={views}"))?;
    ssl_train::config::apply_set(&mut root, &format!("train.batch_size={batch}"))?;
    if objective == "wmse" || objective == "corinfomax" {
        ssl_train::config::apply_set(&mut root, "model.projector=[512,64]")?;
    }
    RunConfig::from_yaml_value(root)
}

struct Bench {
    data: setup::DataSplit,
    device: Device,
    reps: usize,
    batch: usize,
}

impl Bench {
    fn model(&self, cfg: &RunConfig) -> Result<(Model, Optimizer)> {
        let model = model::build_model(cfg, &self.data, &self.device)?;
        let optimizer = model::optimizer(cfg, &model)?;
        Ok((model, optimizer))
    }

    /// `views` noisy copies of the first `B` training images, one tensor per view.
    fn views(&self, views: usize) -> Result<Vec<Tensor>> {
        let positions: Vec<usize> = self.data.train[..self.batch].to_vec();
        let clean = setup::samples(&self.data, &positions, &self.device)?;
        (0..views)
            .map(|v| Ok((&clean + (Tensor::randn_like(&clean, 0.0, 0.1)? * (v as f64 + 1.0))?)?))
            .collect()
    }

    /// Seconds of the encoder (+ projector, if the objective uses one) forward and backward,
    /// view by view as in training, without loss or optimiser.
    fn encoder(&self, cfg: &RunConfig) -> Result<impl FnMut(usize) -> Result<f64> + '_> {
        let (model, _) = self.model(cfg)?;
        let per_view = self.views(cfg.train.views)?;
        Ok(move |_rep| {
            let t = Instant::now();
            let mut total = Tensor::zeros((), candle_core::DType::F32, &self.device)?;
            for view in &per_view {
                let mut out = model.encoder.forward_t(view, true)?;
                if let Some(p) = &model.projector {
                    out = p.forward_t(&out, true)?;
                }
                total = (total + out.sum_all()?)?;
            }
            total.backward()?;
            Ok(t.elapsed().as_secs_f64())
        })
    }

    /// Seconds of a full training step.
    fn step(&self, cfg: &RunConfig) -> Result<impl FnMut(usize) -> Result<f64> + '_> {
        let (mut model, mut optimizer) = self.model(cfg)?;
        let views = cfg.train.views;
        let positions: Vec<usize> = self.data.train[..self.batch].to_vec();
        let per_view = self.views(views)?;
        let ids: Vec<u32> = (0..self.batch as u32).collect();
        let labels = setup::labels(&self.data.dataset, &positions);
        Ok(move |rep| {
            let input = StepInput {
                images: Tensor::cat(&per_view, 0)?,
                views,
                local_images: None,
                instance_ids: &ids,
                labels: &labels,
                progress: progress(rep),
                lr: 1e-4,
            };
            let t = Instant::now();
            trainer::training_step(&mut model, &mut optimizer, &input)?;
            Ok(t.elapsed().as_secs_f64())
        })
    }

    /// Seconds of the objective's loss + backward on `[V, B, D]` projections (`D` the
    /// backbone width for objectives without a projector), with `[V, B, D]` teacher outputs for
    /// objectives that have a teacher.
    fn loss(&self, cfg: &RunConfig) -> Result<impl FnMut(usize) -> Result<f64> + '_> {
        let (mut model, _) = self.model(cfg)?;
        let (views, b) = (cfg.train.views, self.batch);
        let d = match model.projector {
            Some(_) => *cfg.model.projector.last().expect("non-empty projector"),
            None => model.encoder.output_dim(),
        };
        let z = Var::from_tensor(&Tensor::randn(0f32, 1.0, (views, b, d), &self.device)?)?;
        // Teacher outputs of the global views are constants of the loss.
        let teacher = match model.teacher {
            Some(_) => Some(Tensor::randn(0f32, 1.0, (views, b, d), &self.device)?),
            None => None,
        };
        let features = Tensor::zeros((views, b, 1), candle_core::DType::F32, &self.device)?;
        let ids = Ids::range(b, &self.device)?;
        let labels = Ids::new(&vec![0; b], &self.device)?;
        Ok(move |rep| {
            let batch = Batch {
                projections: z.as_tensor(),
                features: &features,
                global_views: views,
                indices: &ids,
                labels: Some(&labels),
                teacher: teacher.as_ref(),
                progress: progress(rep),
                train: true,
                collective: &SingleProcess,
            };
            let t = Instant::now();
            let out = model.objective.loss(&batch)?;
            out.loss.backward()?;
            Ok(t.elapsed().as_secs_f64())
        })
    }

    /// The timers run in turn, `reps` rounds after two warm-up rounds, so that a slow spell of
    /// the machine hits all of them alike: the seconds of each round, per timer.
    fn interleaved(
        &self,
        timers: &mut [&mut dyn FnMut(usize) -> Result<f64>],
    ) -> Result<Vec<Vec<f64>>> {
        let mut rounds = Vec::new();
        for rep in 0..self.reps + 2 {
            let round = timers
                .iter_mut()
                .map(|t| t(rep))
                .collect::<Result<Vec<_>>>()?;
            if rep >= 2 {
                rounds.push(round);
            }
        }
        Ok(rounds)
    }
}

/// Median over rounds of `f(round)`.
fn median_of(rounds: &[Vec<f64>], f: impl Fn(&[f64]) -> f64) -> f64 {
    median(rounds.iter().map(|r| f(r)).collect())
}

fn progress(step: usize) -> Progress {
    Progress {
        step,
        epoch: 0,
        steps_per_epoch: 1000,
        total_steps: 1000,
        seed: 0,
    }
}

/// The host-side parts that issue 6 bounds, each timed in turn with the full step of its
/// objective (default configuration, V = 2): SwAV's Sinkhorn–Knopp on both global crops'
/// `B × K` scores, and SAG-VICReg's kNN affinity, random walk and pairing draw.
fn host_parts(bench: &Bench) -> Result<()> {
    let b = bench.batch;
    let swav = config("swav", 2, b)?;
    let k = ssl_swav::SwavConfig::default().num_prototypes;
    let scores = Tensor::randn(0f32, 0.3, (b, k), &bench.device)?;
    let mut step = bench.step(&swav)?;
    let mut sinkhorn = |_rep: usize| -> Result<f64> {
        let t = Instant::now();
        for _ in 0..2 {
            ssl_swav::sinkhorn(&scores, 0.05, 3)?;
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let rounds = bench.interleaved(&mut [&mut step, &mut sinkhorn])?;
    println!(
        "\nswav Sinkhorn–Knopp, 2 crops of {b} × {k} scores, 3 iterations: {:.2} ms, {:.1} % of the swav step ({:.1} ms)",
        median_of(&rounds, |r| r[1]) * 1e3,
        median_of(&rounds, |r| 100.0 * r[1] / r[0]),
        median_of(&rounds, |r| r[0]) * 1e3,
    );
    let sag = config("sag-vicreg", 2, b)?;
    let d = *sag.model.projector.last().expect("non-empty projector");
    let z = Tensor::randn(0f32, 1.0, (2, b, d), &bench.device)?;
    let mut step = bench.step(&sag)?;
    let mut pairing = |rep: usize| -> Result<f64> {
        let t = Instant::now();
        ssl_sagvicreg::draw_pairing(&z, 5, 20.0, &mut progress(rep).rng(0))?;
        Ok(t.elapsed().as_secs_f64())
    };
    let rounds = bench.interleaved(&mut [&mut step, &mut pairing])?;
    println!(
        "sag-vicreg kNN affinity + random-walk pairing, B = {b}, d = {d}: {:.2} ms, {:.1} % of the sag-vicreg step ({:.1} ms)",
        median_of(&rounds, |r| r[1]) * 1e3,
        median_of(&rounds, |r| 100.0 * r[1] / r[0]),
        median_of(&rounds, |r| r[0]) * 1e3,
    );
    Ok(())
}

fn main() -> Result<()> {
    ssl_core::allocator::keep_freed_memory();
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let reps: usize = flag("--reps").map_or(Ok(10), |r| r.parse())?;
    let only: Option<Vec<String>> =
        flag("--objectives").map(|s| s.split(',').map(str::to_string).collect());
    let batch: usize = flag("--batch").map_or(Ok(128), |b| b.parse())?;
    let data = setup::data(&RunConfig::default())?;
    let bench = Bench {
        data,
        device: Device::Cpu,
        reps,
        batch,
    };
    if let Some(name) = flag("--profile-loss") {
        let mut loss = bench.loss(&config(&name, 2, batch)?)?;
        let seconds: Vec<f64> = (0..reps).map(&mut loss).collect::<Result<_>>()?;
        println!(
            "{name}: loss + backward alone, median {:.2} ms over {reps} calls",
            median(seconds) * 1e3
        );
        return Ok(());
    }
    println!(
        "digits CNN, projector 512-512, B = {batch}, medians of {reps} interleaved rounds after 2 warm-up, {} threads\n",
        rayon::current_num_threads()
    );
    println!(
        "| objective | step V=2 (ms) | loss+backward (ms) | share of step | encoder fwd+bwd (ms) | share of step |\n|---|---|---|---|---|---|"
    );
    for registration in ssl_core::registry() {
        let name = registration.name;
        if only.as_ref().is_some_and(|o| !o.iter().any(|x| x == name)) {
            continue;
        }
        let cfg = config(name, 2, batch)?;
        if let Err(refused) = model::build_model(&cfg, &bench.data, &bench.device) {
            println!("| {name} | refused: {} | | | | |", refused.root_cause());
            continue;
        }
        let (mut step, mut loss) = (bench.step(&cfg)?, bench.loss(&cfg)?);
        let mut encoder = bench.encoder(&cfg)?;
        let rounds = bench.interleaved(&mut [&mut step, &mut loss, &mut encoder])?;
        println!(
            "| {name} | {:.1} | {:.2} | {:.1} % | {:.1} | {:.1} % |",
            median_of(&rounds, |r| r[0]) * 1e3,
            median_of(&rounds, |r| r[1]) * 1e3,
            median_of(&rounds, |r| 100.0 * r[1] / r[0]),
            median_of(&rounds, |r| r[2]) * 1e3,
            median_of(&rounds, |r| 100.0 * r[2] / r[0]),
        );
    }
    host_parts(&bench)?;
    let ratios = flag("--ratio").unwrap_or_else(|| "frossl".to_string());
    for name in ratios.split(',').filter(|n| !n.is_empty()) {
        let mut two = bench.step(&config(name, 2, batch)?)?;
        let mut eight = bench.step(&config(name, 8, batch)?)?;
        let rounds = bench.interleaved(&mut [&mut two, &mut eight])?;
        println!(
            "\n{name} full step: V=2 {:.1} ms, V=8 {:.1} ms, ratio V=8/V=2 = {:.2} (4× the images)",
            median_of(&rounds, |r| r[0]) * 1e3,
            median_of(&rounds, |r| r[1]) * 1e3,
            median_of(&rounds, |r| r[1] / r[0]),
        );
    }
    Ok(())
}
