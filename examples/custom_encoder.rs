//! An encoder of your own, registered by name so that a configuration (YAML, `--encoder`, or the
//! builder) can name it: `cargo run --release -p ssl-examples --example custom_encoder`.
use candle_core::Tensor;
use candle_nn::{Linear, Module, VarBuilder};
use ssl_train::{register_encoder, Encoder, EncoderSpec, RunConfig, Start, Trainer};

/// Two linear layers with a ReLU between, on the flattened image.
struct TwoLayers {
    hidden: Linear,
    out: Linear,
    width: usize,
}

impl Encoder for TwoLayers {
    fn forward_t(&self, x: &Tensor, _train: bool) -> candle_core::Result<Tensor> {
        self.out
            .forward(&self.hidden.forward(&x.flatten_from(1)?)?.relu()?)
    }

    fn output_dim(&self) -> usize {
        self.width
    }
}

fn two_layers(spec: &EncoderSpec, vb: VarBuilder) -> anyhow::Result<Box<dyn Encoder>> {
    let inputs: usize = spec.input_shape.iter().product();
    let width = 64;
    Ok(Box::new(TwoLayers {
        hidden: candle_nn::linear(inputs, 256, vb.pp("hidden"))?,
        out: candle_nn::linear(256, width, vb.pp("out"))?,
        width,
    }))
}

register_encoder! {
    name: "two_layers",
    summary: "two linear layers on the flattened image",
    build: two_layers,
}

pub fn run(out: &std::path::Path, epochs: usize) -> anyhow::Result<ssl_train::RunOutcome> {
    let config = RunConfig::builder()
        .objective("vicreg")
        .encoder("two_layers")
        .epochs(epochs)
        .out(out)
        .build()?;
    let outcome = Trainer::new(config.clone()).start(Start::Overwrite).fit()?;
    println!("{}", outcome.table(&config));
    Ok(outcome)
}

#[allow(dead_code)]
fn main() -> anyhow::Result<()> {
    run("runs/example-custom-encoder".as_ref(), 20).map(drop)
}
