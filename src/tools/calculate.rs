//! `calculate`: evaluates an arithmetic expression exactly where it can (whole
//! numbers, and divisions that come out whole, in 128-bit integers; the rest in
//! `f64`, shown to 10 decimal places at most). It reads symbols (`+ - * / ^ ( )`,
//! `%` as percent, `**`) and the words people write them with ("17 times 23",
//! "15 percent of 240", "20% off 80", "the square root of 81", "2 to the power of
//! 10", "the average of 12, 15 and 21", "3 books at $12.50 each"), so it can be
//! handed a request's own words. Pure and idempotent.

use async_trait::async_trait;
use serde_json::{Value, json};
use troupe_actors::tool::{Tool, ToolContext, ToolError, ToolOutput};

/// The tool.
pub struct Calculate;

/// Its arguments.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The arithmetic: numbers with + - * / ^, parentheses, % and sqrt.
    #[schemars(length(min = 1, max = 500))]
    expression: String,
}

/// Longest expression accepted, in characters (the schema says so too).
const MAX_EXPRESSION: usize = 500;

/// Deepest nesting of parentheses and operators accepted.
const MAX_DEPTH: usize = 64;

#[async_trait]
impl Tool for Calculate {
    fn name(&self) -> &str {
        "calculate"
    }

    fn description(&self) -> &str {
        "Works out arithmetic exactly: + - * / ^, parentheses, percentages (\"15% of 240\"), square roots. \
         Use it for any calculation instead of working it out yourself."
    }

    fn parameters(&self) -> Value {
        troupe_actors::tool::schema_of::<Args>()
    }

    fn idempotent(&self) -> bool {
        true
    }

    /// "Calculating 17 × 23", the expression as read when it can be (a request's
    /// own words are shown as arithmetic), else as given.
    fn describe_start(&self, args: &Value) -> String {
        match args.get("expression").and_then(Value::as_str) {
            Some(expression) if expression.chars().count() <= MAX_EXPRESSION => match tokens(expression) {
                Ok(tokens) if !tokens.is_empty() => format!("Calculating {}", show(&tokens)),
                _ => format!("Calculating {}", expression.trim()),
            },
            _ => "Calculating".to_owned(),
        }
    }

    async fn call(&self, _context: ToolContext, args: Value) -> Result<ToolOutput, ToolError> {
        let Args { expression } = crate::tools::args::parse_args(args)?;
        if expression.chars().count() > MAX_EXPRESSION {
            return Err(ToolError::InvalidArgs(format!("the expression is longer than {MAX_EXPRESSION} characters")));
        }
        let (shown, result) = evaluate(&expression).map_err(ToolError::InvalidArgs)?;
        let text = result.to_string();
        Ok(ToolOutput::value(json!({
            "summary": format!("{shown} = {text}"),
            "expression": shown,
            "result": result.to_json(),
        })))
    }
}

/// `expression` as read (symbols in place of words) and its value, or why it
/// cannot be worked out.
pub fn evaluate(expression: &str) -> Result<(String, Number), String> {
    let product = quantity_at_price(expression);
    let tokens = tokens(product.as_deref().unwrap_or(expression))?;
    if tokens.is_empty() {
        return Err(format!("no arithmetic in {expression:?}"));
    }
    let shown = show(&tokens);
    let mut parser = Parser { tokens: &tokens, at: 0, depth: 0 };
    let value = parser.sum()?;
    match parser.tokens.get(parser.at) {
        None => Ok((shown, value)),
        Some(token) => Err(format!("unexpected {} in {shown:?}", token.text())),
    }
}

/// "I bought 3 books at $12.50 each": a quantity, then "at" or "for" a price
/// "each" ("apiece", "a piece", "a pop", "per …"), and no other number in `text`,
/// written as their product (`3 * 12.50`). Anything else is left as it is.
fn quantity_at_price(text: &str) -> Option<String> {
    let lower = text.to_lowercase();
    let words: Vec<&str> = lower
        .split_whitespace()
        .map(|word| word.trim_start_matches(['$', '€', '£', '¥']).trim_end_matches(['.', ',', '?', '!', ';', ':']))
        .collect();
    let number = |word: &str| {
        let digits = word.replace(',', "");
        (digits.starts_with(|c: char| c.is_ascii_digit()) && digits.parse::<f64>().is_ok()).then_some(digits)
    };
    let numbers: Vec<(usize, String)> =
        words.iter().enumerate().filter_map(|(at, word)| number(word).map(|digits| (at, digits))).collect();
    let [(quantity_at, quantity), (price_at, price)] = numbers.as_slice() else { return None };
    let between = price_at.checked_sub(1).filter(|&at| at > *quantity_at)?;
    let unit = |offset: usize| words.get(price_at + offset).copied();
    let each = matches!(unit(1), Some("each" | "apiece" | "per"))
        || (unit(1) == Some("a") && matches!(unit(2), Some("piece" | "pop")));
    (matches!(words[between], "at" | "for") && each).then(|| format!("{quantity} * {price}"))
}

/// A number: exact while it is whole, else a float.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// A whole number.
    Whole(i128),
    /// Anything else.
    Real(f64),
}

impl Number {
    fn real(self) -> f64 {
        match self {
            Number::Whole(whole) => whole as f64,
            Number::Real(real) => real,
        }
    }

    /// A float, back to a whole number when it is one (and small enough to be exact).
    fn settle(real: f64) -> Result<Number, String> {
        if !real.is_finite() {
            return Err("the result is too large".to_owned());
        }
        let whole = rounded(real);
        if whole.fract() == 0.0 && whole.abs() < 9.0e15 {
            return Ok(Number::Whole(whole as i128));
        }
        Ok(Number::Real(real))
    }

    fn to_json(self) -> Value {
        match self {
            Number::Whole(whole) => match i64::try_from(whole) {
                Ok(small) => json!(small),
                Err(_) => json!(whole.to_string()),
            },
            Number::Real(real) => json!(rounded(real)),
        }
    }
}

/// `real` to 10 decimal places: 0.1 + 0.2 is 0.3.
fn rounded(real: f64) -> f64 {
    if real.abs() >= 1.0e9 {
        return real;
    }
    (real * 1.0e10).round() / 1.0e10
}

impl std::fmt::Display for Number {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Number::Whole(whole) => write!(f, "{whole}"),
            Number::Real(real) => {
                let text = format!("{:.10}", rounded(*real));
                let text = text.trim_end_matches('0').trim_end_matches('.');
                f.write_str(if text == "-0" { "0" } else { text })
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Number(Number, String),
    Op(char),
    Open,
    Close,
    Percent,
    Sqrt,
    /// "average" or "mean": the numbers after it, added up and divided by how
    /// many there are (rewritten so by [`tokens`]).
    Average,
    /// "off", between a percentage and a number: the number less that
    /// percentage of it (rewritten so by [`tokens`]).
    Off,
}

impl Token {
    fn text(&self) -> String {
        match self {
            Token::Number(_, written) => written.clone(),
            Token::Op(op) => op.to_string(),
            Token::Open => "(".to_owned(),
            Token::Close => ")".to_owned(),
            Token::Percent => "%".to_owned(),
            Token::Sqrt => "√".to_owned(),
            Token::Average => "average".to_owned(),
            Token::Off => "off".to_owned(),
        }
    }
}

/// The expression as written back: symbols, single spaces around binary operators.
fn show(tokens: &[Token]) -> String {
    let mut out = String::new();
    for (index, token) in tokens.iter().enumerate() {
        if index > 0 && matches!(token, Token::Number(..) | Token::Open | Token::Sqrt) {
            match tokens[index - 1] {
                Token::Number(..) => out.push(' '),
                Token::Percent => out.push_str(" of "),
                _ => {}
            }
        }
        let binary = matches!(token, Token::Op(_))
            && index > 0
            && matches!(tokens[index - 1], Token::Number(..) | Token::Close | Token::Percent);
        match token {
            Token::Op(op) if binary => {
                let op = match op {
                    '*' => '×',
                    '/' => '÷',
                    other => *other,
                };
                out.push(' ');
                out.push(op);
                out.push(' ');
            }
            other => out.push_str(&other.text()),
        }
    }
    out
}

/// Words that mean nothing to the arithmetic ("what is 2 plus 2?").
const FILLER: &[&str] = &[
    "what",
    "what's",
    "whats",
    "is",
    "are",
    "the",
    "of",
    "a",
    "an",
    "calculate",
    "compute",
    "equals",
    "equal",
    "to",
    "by",
    "how",
    "much",
    "many",
    "please",
    "result",
    "value",
    "answer",
    "number",
    "and",
    "then",
    "get",
    "you",
    "do",
    "does",
    "make",
    "makes",
    "work",
    "out",
    "find",
    "tell",
    "me",
    "evaluate",
    "solve",
];

/// The tokens of `text`: numbers (with `,` between thousands, a currency sign
/// before them ignored), symbols, and words for them.
fn tokens(text: &str) -> Result<Vec<Token>, String> {
    let text = text.to_lowercase().replace("square root", "sqrt");
    let chars: Vec<char> = text.chars().collect();
    let mut out: Vec<Token> = Vec::new();
    let mut at = 0;
    while at < chars.len() {
        let c = chars[at];
        if c.is_ascii_digit() || (c == '.' && chars.get(at + 1).is_some_and(char::is_ascii_digit)) {
            let start = at;
            while at < chars.len()
                && (chars[at].is_ascii_digit()
                    || (chars[at] == '.' && chars.get(at + 1).is_some_and(char::is_ascii_digit))
                    || (chars[at] == ',' && thousands(&chars, at)))
            {
                at += 1;
            }
            let written: String = chars[start..at].iter().collect();
            let digits = written.replace(',', "");
            let number = if digits.contains('.') {
                Number::Real(digits.parse::<f64>().map_err(|_| format!("{written:?} is not a number"))?)
            } else {
                match digits.parse::<i128>() {
                    Ok(whole) => Number::Whole(whole),
                    Err(_) => return Err(format!("{written} is too large")),
                }
            };
            out.push(Token::Number(number, digits));
            continue;
        }
        if c.is_alphabetic() {
            let start = at;
            while at < chars.len() && (chars[at].is_alphabetic() || chars[at] == '\'') {
                at += 1;
            }
            let word: String = chars[start..at].iter().collect();
            word_token(&word, &mut out)?;
            continue;
        }
        at += 1;
        match c {
            '+' | '-' | '−' | '–' => out.push(Token::Op(if c == '+' { '+' } else { '-' })),
            '*' if chars.get(at) == Some(&'*') => {
                at += 1;
                out.push(Token::Op('^'));
            }
            '*' | '×' | '·' => out.push(Token::Op('*')),
            '/' | '÷' => out.push(Token::Op('/')),
            '^' => out.push(Token::Op('^')),
            '(' | '[' => out.push(Token::Open),
            ')' | ']' => out.push(Token::Close),
            '%' => out.push(Token::Percent),
            '√' => out.push(Token::Sqrt),
            '²' => out.extend(power_of(2)),
            '³' => out.extend(power_of(3)),
            ' ' | '\t' | '\n' | '?' | '!' | '=' | '$' | '€' | '£' | '¥' | '\'' | '"' | ',' => {}
            // A full stop ends a sentence.
            '.' if chars.get(at).is_none_or(|next| next.is_whitespace()) => {}
            other => return Err(format!("{other:?} is not arithmetic")),
        }
    }
    average(off(out)?)
}

/// `tokens` with "20% off 80" written out as `80 - 20% of 80` (in parentheses
/// within a longer expression).
fn off(mut tokens: Vec<Token>) -> Result<Vec<Token>, String> {
    while let Some(at) = tokens.iter().position(|token| *token == Token::Off) {
        let percent = at.saturating_sub(2);
        let Some([rate @ Token::Number(..), Token::Percent, Token::Off, whole @ Token::Number(..)]) =
            tokens.get(percent..at + 2)
        else {
            return Err("\"off\" goes between a percentage and a number (\"20% off 80\")".to_owned());
        };
        let mut written = vec![whole.clone(), Token::Op('-'), rate.clone(), Token::Percent, whole.clone()];
        if percent > 0 || at + 2 < tokens.len() {
            written.insert(0, Token::Open);
            written.push(Token::Close);
        }
        tokens.splice(percent..at + 2, written);
    }
    Ok(tokens)
}

/// `tokens` with "the average of 12, 15 and 21" written out as
/// `(12 + 15 + 21) / 3`; an average of anything but a list of numbers is refused.
fn average(tokens: Vec<Token>) -> Result<Vec<Token>, String> {
    let Some(at) = tokens.iter().position(|token| *token == Token::Average) else { return Ok(tokens) };
    let numbers = &tokens[at + 1..];
    if at > 0 || numbers.is_empty() || !numbers.iter().all(|token| matches!(token, Token::Number(..))) {
        return Err("an average is of a list of numbers (\"the average of 12, 15 and 21\")".to_owned());
    }
    let mut out = vec![Token::Open];
    for (index, number) in numbers.iter().enumerate() {
        if index > 0 {
            out.push(Token::Op('+'));
        }
        out.push(number.clone());
    }
    let count = numbers.len() as i128;
    out.extend([Token::Close, Token::Op('/'), Token::Number(Number::Whole(count), count.to_string())]);
    Ok(out)
}

/// Whether the `,` at `at` separates thousands: three digits follow, then no digit.
fn thousands(chars: &[char], at: usize) -> bool {
    at > 0
        && chars[at - 1].is_ascii_digit()
        && (1..=3).all(|ahead| chars.get(at + ahead).is_some_and(char::is_ascii_digit))
        && !chars.get(at + 4).is_some_and(char::is_ascii_digit)
}

/// `^ exponent`, as "squared" or `²` write it.
fn power_of(exponent: i128) -> [Token; 2] {
    [Token::Op('^'), Token::Number(Number::Whole(exponent), exponent.to_string())]
}

fn word_token(word: &str, out: &mut Vec<Token>) -> Result<(), String> {
    match word {
        "plus" => out.push(Token::Op('+')),
        "minus" => out.push(Token::Op('-')),
        "times" | "x" | "multiplied" => out.push(Token::Op('*')),
        "divided" | "over" => out.push(Token::Op('/')),
        "percent" | "pct" => out.push(Token::Percent),
        "squared" => out.extend(power_of(2)),
        "cubed" => out.extend(power_of(3)),
        "power" | "raised" => {
            if out.last() != Some(&Token::Op('^')) {
                out.push(Token::Op('^'));
            }
        }
        "sqrt" => out.push(Token::Sqrt),
        "pi" => out.push(Token::Number(Number::Real(std::f64::consts::PI), "π".to_owned())),
        "mod" | "modulo" => out.push(Token::Op('m')),
        "average" | "mean" => out.push(Token::Average),
        "off" => out.push(Token::Off),
        word if FILLER.contains(&word) => {}
        word => return Err(format!("{word:?} is not arithmetic")),
    }
    Ok(())
}

struct Parser<'a> {
    tokens: &'a [Token],
    at: usize,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn deeper(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH { Err("the expression is nested too deeply".to_owned()) } else { Ok(()) }
    }

    /// sum := product (('+' | '-') product)*
    fn sum(&mut self) -> Result<Number, String> {
        let mut value = self.product()?;
        while let Some(Token::Op(op @ ('+' | '-'))) = self.peek() {
            let op = *op;
            self.at += 1;
            let right = self.product()?;
            value = apply(op, value, right)?;
        }
        Ok(value)
    }

    /// product := unary (('*' | '/' | 'mod') unary | unary)*, a number right after
    /// a percentage multiplying it ("15% of 240").
    fn product(&mut self) -> Result<Number, String> {
        let mut value = self.unary()?;
        loop {
            match self.peek() {
                Some(Token::Op(op @ ('*' | '/' | 'm'))) => {
                    let op = *op;
                    self.at += 1;
                    let right = self.unary()?;
                    value = apply(op, value, right)?;
                }
                Some(Token::Number(..) | Token::Open | Token::Sqrt)
                    if self.at > 0 && self.tokens[self.at - 1] == Token::Percent =>
                {
                    let right = self.unary()?;
                    value = apply('*', value, right)?;
                }
                _ => return Ok(value),
            }
        }
    }

    /// unary := ('-' | '+') unary | power
    fn unary(&mut self) -> Result<Number, String> {
        self.deeper()?;
        let value = match self.peek() {
            Some(Token::Op('-')) => {
                self.at += 1;
                apply('-', Number::Whole(0), self.unary()?)
            }
            Some(Token::Op('+')) => {
                self.at += 1;
                self.unary()
            }
            _ => self.power(),
        };
        self.depth -= 1;
        value
    }

    /// power := postfix ('^' unary)?
    fn power(&mut self) -> Result<Number, String> {
        let base = self.postfix()?;
        if let Some(Token::Op('^')) = self.peek() {
            self.at += 1;
            let exponent = self.unary()?;
            return apply('^', base, exponent);
        }
        Ok(base)
    }

    /// postfix := primary '%'*
    fn postfix(&mut self) -> Result<Number, String> {
        let mut value = self.primary()?;
        while let Some(Token::Percent) = self.peek() {
            self.at += 1;
            value = Number::settle(value.real() / 100.0)?;
        }
        Ok(value)
    }

    /// primary := number | '(' sum ')' | '√' primary
    fn primary(&mut self) -> Result<Number, String> {
        let token = self.peek().cloned();
        self.at += 1;
        match token {
            Some(Token::Number(number, _)) => Ok(number),
            Some(Token::Open) => {
                self.deeper()?;
                let value = self.sum()?;
                self.depth -= 1;
                match self.peek() {
                    Some(Token::Close) => {
                        self.at += 1;
                        Ok(value)
                    }
                    _ => Err("a parenthesis is not closed".to_owned()),
                }
            }
            Some(Token::Sqrt) => {
                self.deeper()?;
                let value = self.postfix()?;
                self.depth -= 1;
                if value.real() < 0.0 {
                    return Err("the square root of a negative number is not a real number".to_owned());
                }
                Number::settle(value.real().sqrt())
            }
            Some(other) => Err(format!("expected a number, found {}", other.text())),
            None => Err("the expression ends where a number should be".to_owned()),
        }
    }
}

/// `left op right`, whole numbers kept exact where the result is whole.
fn apply(op: char, left: Number, right: Number) -> Result<Number, String> {
    if let (Number::Whole(a), Number::Whole(b)) = (left, right) {
        let exact = match op {
            '+' => a.checked_add(b),
            '-' => a.checked_sub(b),
            '*' => a.checked_mul(b),
            '/' | 'm' if b == 0 => return Err("division by zero".to_owned()),
            '/' => (a % b == 0).then(|| a / b),
            'm' => Some(a.rem_euclid(b)),
            '^' => u32::try_from(b).ok().and_then(|b| a.checked_pow(b)),
            _ => None,
        };
        if let Some(exact) = exact {
            return Ok(Number::Whole(exact));
        }
    }
    let (a, b) = (left.real(), right.real());
    let real = match op {
        '+' => a + b,
        '-' => a - b,
        '*' => a * b,
        '/' | 'm' if b == 0.0 => return Err("division by zero".to_owned()),
        '/' => a / b,
        'm' => a.rem_euclid(b),
        '^' => a.powf(b),
        other => return Err(format!("unknown operator {other}")),
    };
    if real.is_nan() {
        return Err("the result is not a real number".to_owned());
    }
    Number::settle(real)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(expression: &str) -> String {
        match evaluate(expression) {
            Ok((_, number)) => number.to_string(),
            Err(why) => panic!("{expression:?}: {why}"),
        }
    }

    #[test]
    fn symbols_and_precedence() {
        let cases = [
            ("17 * 23", "391"),
            ("2 + 3 * 4", "14"),
            ("(2 + 3) * 4", "20"),
            ("2 ^ 3 ^ 2", "512"), // powers group to the right
            ("2**10", "1024"),
            ("-3 ^ 2", "-9"),
            ("10 - 4 - 3", "3"), // left to right
            ("7 / 2", "3.5"),
            ("144 / 12", "12"),
            ("0.1 + 0.2", "0.3"),
            ("1 / 3", "0.3333333333"),
            ("17 mod 5", "2"),
            ("√81", "9"),
        ];
        for (expression, expected) in cases {
            assert_eq!(value(expression), expected, "{expression}");
        }
    }

    #[test]
    fn words_people_write() {
        let cases = [
            ("What is 17 times 23?", "391"),
            ("What is 17 times 23.", "391"),
            ("15% of 240", "36"),
            ("what is 15 percent of 240", "36"),
            ("240 * 15%", "36"),
            ("the square root of 144", "12"),
            ("2 to the power of 10", "1024"),
            ("12 squared", "144"),
            ("100 divided by 8", "12.5"),
            ("1,234 + 5,678", "6912"),
            ("$4.50 x 3", "13.5"),
            ("3 × 4 ÷ 2", "6"),
            ("What is 20 percent off 80?", "64"),
            ("25% off $60", "45"),
            ("2 * 10% off 50", "90"),
            ("What is the average of 12, 15 and 21?", "16"),
            ("the mean of 1, 2, 3 and 5", "2.75"),
            ("I bought 3 books at $12.50 each. How much did I spend?", "37.5"),
            ("How much are 4 tickets for €7.25 apiece?", "29"),
            ("2 kg of apples at 3.40 per kg", "6.8"),
            ("1,200 bolts at $0.05 a piece", "60"),
        ];
        for (expression, expected) in cases {
            assert_eq!(value(expression), expected, "{expression}");
        }
    }

    #[test]
    fn exact_where_whole() {
        assert_eq!(value("99999999999 * 99999999999"), "9999999999800000000001");
        assert_eq!(value("2 ^ 100"), "1267650600228229401496703205376");
        assert_eq!(value("2 ^ -1"), "0.5");
    }

    #[test]
    fn what_cannot_be_worked_out_says_why() {
        let error = |expression: &str| evaluate(expression).err().unwrap_or_default();
        assert_eq!(error("1 / 0"), "division by zero");
        assert_eq!(error("5 mod 0"), "division by zero");
        assert_eq!(error("how are you"), "no arithmetic in \"how are you\"");
        assert_eq!(error("3,5 + 1"), "unexpected 5 in \"3 5 + 1\"", "a decimal comma is not read as thousands");
        assert_eq!(error("the square of 5"), "\"square\" is not arithmetic");
        assert_eq!(error("add 3 and 4"), "\"add\" is not arithmetic");
        assert_eq!(error("what is it"), "\"it\" is not arithmetic");
        assert_eq!(error("(1 + 2"), "a parenthesis is not closed");
        assert_eq!(error("2 +"), "the expression ends where a number should be");
        assert_eq!(error("sqrt(-4)"), "the square root of a negative number is not a real number");
        assert_eq!(error("10 ^ 400"), "the result is too large");
        assert_eq!(error(&"(".repeat(200)), "the expression is nested too deeply");
        assert_eq!(error("?"), "no arithmetic in \"?\"");
        assert_eq!(error("3 4"), "unexpected 4 in \"3 4\"");
        let average = "an average is of a list of numbers (\"the average of 12, 15 and 21\")";
        assert_eq!(error("the average rainfall in 2020"), "\"rainfall\" is not arithmetic");
        assert_eq!(error("2 + the average of 3 and 5"), average);
        assert_eq!(error("the average of 3 + 5"), average);
        // A quantity at a price each only with no other number, and the price after "at".
        assert_eq!(error("3 books at $12.50 each and a pen for $2"), "\"books\" is not arithmetic");
        assert_eq!(error("$12.50 each at 3 shops"), "\"each\" is not arithmetic");
        assert_eq!(error("3 books at $12.50"), "\"books\" is not arithmetic");
        let off = "\"off\" goes between a percentage and a number (\"20% off 80\")";
        assert_eq!(error("20 off 80"), off);
        assert_eq!(error("20% off"), off);
        assert_eq!(error("off 80"), off);
    }

    #[tokio::test]
    async fn the_result_names_the_expression_and_its_value() {
        let context = troupe_actors::testing::tool_context("default");
        let output = match Calculate.call(context, json!({"expression": "What is 17 times 23?"})).await {
            Ok(output) => output.value,
            Err(error) => panic!("{error}"),
        };
        assert_eq!(output, json!({"summary": "17 × 23 = 391", "expression": "17 × 23", "result": 391}));
        let context = troupe_actors::testing::tool_context("default");
        let percent = Calculate.call(context, json!({"expression": "What is 15 percent of 240?"})).await;
        assert_eq!(percent.ok().map(|output| output.value["summary"].clone()), Some(json!("15% of 240 = 36")));
        let context = troupe_actors::testing::tool_context("default");
        let off = Calculate.call(context, json!({"expression": "What is 20 percent off 80?"})).await;
        assert_eq!(off.ok().map(|output| output.value["summary"].clone()), Some(json!("80 - 20% of 80 = 64")));
        let context = troupe_actors::testing::tool_context("default");
        let mean = Calculate.call(context, json!({"expression": "the average of 12, 15 and 21"})).await;
        assert_eq!(mean.ok().map(|output| output.value["summary"].clone()), Some(json!("(12 + 15 + 21) ÷ 3 = 16")));
        assert_eq!(Calculate.describe_start(&json!({"expression": "What is 17 times 23?"})), "Calculating 17 × 23");
        assert_eq!(Calculate.describe_start(&json!({"expression": "17 apples"})), "Calculating 17 apples");
        let context = troupe_actors::testing::tool_context("default");
        let refused = Calculate.call(context, json!({"expression": "1/0"})).await;
        assert!(matches!(refused, Err(ToolError::InvalidArgs(why)) if why == "division by zero"));
    }
}
